"""Huge pages for the large buffers a compiled call allocates (Linux, CPU).

A buffer of tens of MB that torch's CPU allocator takes fresh from the OS is faulted in one 4 KB page at a time by
the first kernel that writes it: on this kind of machine that costs about 1 µs a page, so writing a fresh 94 MB
embedding gradient takes 25 ms where writing it again takes 3 ms. Where transparent huge pages are in "madvise"
mode (the common default), `advise_huge_pages(ptr, nbytes)` marks the buffer's whole 2 MB pages MADV_HUGEPAGE
before anything touches them, so they fault in 2 MB at a time. The executor calls it only for buffers of at least
HUGE_PAGE_MIN_BYTES; with THP "always" or "never", or off Linux, `huge_page_advisor()` is None and nothing is done.
"""
from __future__ import annotations
import ctypes
import functools
import sys

HUGE_PAGE = 2 << 20
HUGE_PAGE_MIN_BYTES = 8 << 20  # smaller buffers mostly come back from the allocator's heap, already faulted in
_MADV_HUGEPAGE = 14
_THP_MODE = "/sys/kernel/mm/transparent_hugepage/enabled"


def _thp_mode() -> str | None:
  """The selected THP mode ("always", "madvise" or "never"), or None when the kernel does not say."""
  try:
    with open(_THP_MODE) as f: text = f.read()
  except OSError: return None
  start, end = text.find("["), text.find("]")
  return text[start + 1:end] if 0 <= start < end else None


@functools.cache
def huge_page_advisor():
  """madvise(2) as a ctypes function when advising helps (Linux, THP in "madvise" mode), else None."""
  if not sys.platform.startswith("linux") or _thp_mode() != "madvise": return None
  try:
    fn = ctypes.CDLL(None, use_errno=True).madvise
  except (OSError, AttributeError): return None
  fn.argtypes, fn.restype = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int], ctypes.c_int
  return fn


def advise_huge_pages(ptr: int, nbytes: int) -> None:
  """Ask for huge pages over the whole 2 MB pages inside [ptr, ptr + nbytes). A refusal (EINVAL) changes nothing."""
  madvise = huge_page_advisor()
  if madvise is None: return
  start = (ptr + HUGE_PAGE - 1) & ~(HUGE_PAGE - 1)
  end = (ptr + nbytes) & ~(HUGE_PAGE - 1)
  if end > start: madvise(start, end - start, _MADV_HUGEPAGE)
