/* Subcommands of the one `baton` binary. Each lives in its own file and
 * returns the process exit status (0 ok, 1 failure, 2 usage error). */
#ifndef BT_LAUNCH_CLI_H
#define BT_LAUNCH_CLI_H

int cmd_run(int argc, char **argv);      /* launch/cmd_run.c: train from a job file */
int cmd_graph(int argc, char **argv);    /* launch/cmd_graph.c: print the actor graph */
int cmd_flops(int argc, char **argv);
int cmd_convert(int argc, char **argv);  /* launch/cmd_convert.c: checkpoint <-> HF */    /* launch/cmd_flops.c: FLOPs per token, MFU */
int cmd_eval(int argc, char **argv);     /* launch/cmd_eval.c: loss/perplexity */
int cmd_generate(int argc, char **argv); /* launch/cmd_generate.c */
int cmd_data(int argc, char **argv);     /* launch/cmd_data.c: data prepare */
int cmd_trace(int argc, char **argv);    /* launch/cmd_trace.c: merge traces */
int cmd_bench(int argc, char **argv);    /* bench/cmd_bench.c: benchmarks */
int cmd_worker(int argc, char **argv);   /* launch/cmd_worker.c: internal, a rank process */
int cmd_agent(int argc, char **argv);    /* launch/cmd_agent.c: internal, one host's ranks (ssh) */

#endif
