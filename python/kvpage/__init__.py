"""kvpage: KV-cache pages for LLM engines, over libkvpage.so (ctypes).

  kvpage.PageFile   batched page I/O on one storage file
  kvpage.Store      put/get pages by key on one rank's file (embedded or
                    remote metadata)
  kvpage.page_keys  chained SHA-256 page keys (SGLang's, optionally salted)
  kvpage.compat.Hf3fsClient  a drop-in for the engines' page-I/O client
"""
from kvpage import _lib
from kvpage.errors import KvpageError, KvpageValueError
from kvpage.keys import page_keys
from kvpage.pagefile import PageFile
from kvpage.store import ALREADY, STORED, Store

__all__ = ["PageFile", "Store", "page_keys", "KvpageError", "KvpageValueError", "STORED",
           "ALREADY", "library_path"]
__version__ = "0.1.0"

library_path = _lib.path
