/*
 * The metadata backends: one row each, in the order kvp_meta_backend_info
 * lists their schemes (and error messages name them). A row names the
 * backend's table of operations (struct kvp__meta_ops, src/meta/backend.h),
 * which carries everything else about it: its name, schemes, what it
 * promises. Included with KVP__META_BACKEND(ops) defined, by backend.h (the
 * declarations) and by backends.c (the table); no include guard.
 *
 * Adding a backend: its file, and a row here (docs/adding-a-backend.md).
 */
KVP__META_BACKEND(kvp__local_ops)          /* src/meta/local/local.c: mem:, file: */
KVP__META_BACKEND(kvp__http_ops)           /* src/meta/http/http.c: http:// */
KVP__META_BACKEND(kvp__redis_ops)          /* src/meta/redis/redis.c: redis:// */
KVP__META_BACKEND(kvp__redis_sentinel_ops) /* src/meta/redis/redis.c: redis-sentinel:// */
#ifdef KVP_TEST_BACKENDS
/* Test builds only (the unit tests' libkvpage_internal.a, never
 * libkvpage.so): backends of tests/backends/. */
KVP__META_BACKEND(kvp__meta_testmem_ops) /* tests/backends/meta_testmem.c: testmem: */
#endif
