/* fleetgate-agent fetch URL SHA256 OUT: one checked download (fetch.c). */
#ifndef AG_FETCH_H
#define AG_FETCH_H

/* argv[0] is "fetch". Returns the exit code: 0 OUT is there and its digest matched,
 * 1 failed, 2 usage. */
int ag_fetch_main(int argc, char **argv);

#endif
