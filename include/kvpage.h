/* kvpage.h — umbrella header: everything public in kvpage. */
#ifndef KVPAGE_H
#define KVPAGE_H
#include "kvpage/error.h"
#include "kvpage/keys.h"
#include "kvpage/meta.h"
#include "kvpage/pagefile.h"
#include "kvpage/size.h"
#include "kvpage/store.h"
#endif
