/* Internal entry point of `kvpage serve` (tools/kvpage.c calls it). */
#ifndef KVP_SERVER_SERVE_H
#define KVP_SERVER_SERVE_H

/* Parses serve's flags (argv[0] is "serve"), runs until SIGINT/SIGTERM.
 * Returns the process exit status. */
int kvp__serve_main(int argc, char **argv);

#endif
