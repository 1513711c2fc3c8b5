#include "launch/version.h"

#ifndef BATON_REVISION
#define BATON_REVISION "unknown"
#endif

const char *baton_revision(void) { return BATON_REVISION; }
