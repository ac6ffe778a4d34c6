/*
 * owner.h — the one metadata owner of a page file (kvp_store_claim): who it
 * is, recorded in PATH.owner beside the file.
 */
#ifndef KVPAGE_STORE_OWNER_H
#define KVPAGE_STORE_OWNER_H

#include <stdint.h>
#include "kvpage/error.h"

/*
 * Compares the owner recorded beside path with (loc, id, dep, pool, rank):
 * loc canonical already, id the metadata's identity (kvp_meta_identity) or
 * NULL when unknown or none. The metadata is the same when both the record
 * and id have an identity and they are equal, else (a record of an older
 * kvpage, a state without one) when the locations are. Returns 0 (the same
 * owner, or path is not a regular file: a block device has no record), 1
 * (no record, or a record of a page file that does not exist: nothing to
 * protect), 2 (defer, id NULL, and the record has an identity and these
 * names: the metadata must be opened and asked), -EEXIST (another owner:
 * err names both and the fix, rule KVP_RULE_OWNER), or another negative
 * errno (the record unreadable or malformed, KVP_RULE_IO).
 */
int kvp__owner_check(const char *path, const char *loc, const char *id, int defer, const char *dep,
                     const char *pool, uint32_t rank, struct kvp_error *err);

/* Writes the record, with the identity line when id is not NULL (temporary file, fsync, link or
 * rename, fsync of the directory). Returns 0, 1 when the directory refuses new files (EACCES,
 * EROFS, EPERM: nothing recorded, the open goes on), -EEXIST when another
 * process wrote a different one meanwhile (err as kvp__owner_check), or a
 * negative errno (KVP_RULE_IO). */
int kvp__owner_write(const char *path, const char *loc, const char *id, const char *dep,
                     const char *pool, uint32_t rank, struct kvp_error *err);

/* Removes the record (what a failed open that wrote it undoes). */
void kvp__owner_remove(const char *path);

#endif
