"""Every `baton` command shown in README.md and docs/*.md (indented code
lines, continuations joined) is accounted for (tests/sh/test_docs.sh runs
this):
  - a synopsis (DIR, FILE, JOB, TEXT, N, ... placeholders): every --option it
    shows is in that command's --help;
  - a command on the committed fixtures: run here; when the doc shows its
    output on the next line, the numbers are compared (relative 1e-6);
  - anything else (it needs the Austen corpus, a fetched model or a GPU): a
    test or a tools/ script runs the same subcommand on the same job or model
    (the first argument that is a path), else it is reported.
Prints one line per command and exits 1 when any is not accounted for."""
import glob, json, os, re, shlex, subprocess, sys

baton = sys.argv[1]
docs = ["README.md"] + sorted(glob.glob("docs/*.md"))
PLACE = re.compile(r"\b(DIR|FILE|JOB|TEXT|SRC|PATH|N|T|R|P|CMD|FILE\.gguf)\b|\.\.\.|\|")
cmds = []
for d in docs:
    lines = open(d).read().split("\n")
    i = 0
    while i < len(lines):
        l = lines[i]
        m = re.match(r"^ {4,}(?:\$ )?((?:build/)?baton \S.*)$", l)
        if m:
            c = m.group(1)
            while c.rstrip().endswith("\\") and i + 1 < len(lines):
                i += 1
                c = c.rstrip()[:-1] + " " + lines[i].strip()
            nxt = lines[i + 1].strip() if i + 1 < len(lines) else ""
            c = re.sub(r"\s+", " ", re.sub(r"\s+#.*$", "", c)).strip()
            if not c.startswith("baton run: "):     # an error message, not a command
                cmds.append((d, c, nxt))
        i += 1

scripts = {}
for p in glob.glob("tests/sh/*.sh") + glob.glob("tools/*.sh") + glob.glob("tests/*.c") + [".ci/run"]:
    if p == "tools/docs-tour.sh": continue   # below, line by line
    if os.path.exists(p):
        scripts[p] = open(p, errors="replace").read()

# tools/docs-tour.sh runs the documents' commands as they are written
tour = set()
tl = open("tools/docs-tour.sh").read().split("\n")
for i, l in enumerate(tl):
    l = l.strip()
    if re.match(r"(build/)?baton ", l):
        while l.endswith("\\") and i + 1 < len(tl):
            i += 1
            l = l[:-1].rstrip() + " " + tl[i].strip()
        tour.add(re.sub(r"\s+", " ", l.replace("build/baton ", "baton ")))

def helptext(sub):
    r = subprocess.run([baton, sub, "--help"], capture_output=True, text=True)
    return r.stdout + r.stderr

bad = 0
for d, c, nxt in cmds:
    words = shlex.split(c.replace("DIR|tokenizer.json|MODEL.gguf", "DIR"), posix=True)
    sub = words[1]
    args = words[2:]
    paths = [a for a in args if not a.startswith("-") and ("/" in a or a.endswith(".yaml"))]
    if PLACE.search(c.split(" ", 2)[2] if len(c.split(" ")) > 2 else ""):
        h = helptext(sub if sub != "data" else "data")
        opts = [o for o in re.findall(r"(--[a-z][a-z-]*)", c)]
        missing = [o for o in opts if o not in h]
        ok = not missing
        print("%-5s synopsis %s: %s%s" % ("ok" if ok else "BAD", d, c, " (not in --help: %s)" % missing if missing else ""))
        bad += not ok
        continue
    fixture = paths and "cuda" not in c and all(
        p.startswith("tests/fixtures/") or (sub == "flops" and p.startswith("jobs/")) for p in paths)
    if fixture:
        r = subprocess.run([baton] + words[1:], capture_output=True, text=True, timeout=300)
        ok = r.returncode == 0
        why = r.stderr.strip()[-200:]
        if ok and nxt.startswith("{"):
            shown, got = json.loads(nxt), json.loads(r.stdout.strip().split("\n")[-1])
            for k, v in shown.items():
                if isinstance(v, (int, float)) and abs(got.get(k, float("nan")) - v) > 1e-6 * abs(v):
                    ok, why = False, "shows %s %r, prints %r" % (k, v, got.get(k))
        print("%-5s ran      %s: %s%s" % ("ok" if ok else "BAD", d, c, "" if ok else " (" + why + ")"))
        bad += not ok
        continue
    key = paths[0] if paths else None
    where = [p for p, t in scripts.items()
             if re.search(r"\b%s\b" % re.escape(sub), t) and (key is None or key in t)]
    if c.replace("build/baton ", "baton ") in tour:
        where.insert(0, "tools/docs-tour.sh (verbatim)")
    ok = bool(where)
    print("%-5s covered  %s: %s%s" % ("ok" if ok else "BAD", d, c, " by " + where[0] if ok else " (no test or tools/ script runs it)"))
    bad += not ok
print("%d commands, %d not accounted for" % (len(cmds), bad))
sys.exit(1 if bad else 0)
