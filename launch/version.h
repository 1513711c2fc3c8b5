/* What `baton --version` prints and every run directory records: the
 * release and the source revision the binary was built from (git's commit,
 * "-dirty" when the tree had uncommitted changes; the Makefile passes it). */
#ifndef BT_LAUNCH_VERSION_H
#define BT_LAUNCH_VERSION_H

#define BATON_RELEASE "0.1.0"

const char *baton_revision(void);

#endif
