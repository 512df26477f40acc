"""The host allocator's setting: made where glibc serves the process, left alone where the
user chose the allocator or its settings."""
import os
import platform

import pytest

from clients.devices import keep_freed_memory

GLIBC = platform.system() == "Linux" and platform.libc_ver()[0] == "glibc"


@pytest.mark.skipif(not GLIBC, reason="glibc's mallopt only")
def test_glibc_is_told_to_keep_freed_memory(monkeypatch):
    for name in ["LD_PRELOAD", "GLIBC_TUNABLES", *(name for name in os.environ if name.startswith("MALLOC_"))]:
        monkeypatch.delenv(name, raising=False)
    assert keep_freed_memory()


@pytest.mark.parametrize("name, value", [("LD_PRELOAD", "libjemalloc.so.2"), ("MALLOC_MMAP_THRESHOLD_", "65536"),
                                         ("GLIBC_TUNABLES", "glibc.malloc.trim_threshold=0")])
def test_a_users_allocator_or_settings_are_left_alone(monkeypatch, name, value):
    monkeypatch.setenv(name, value)
    assert not keep_freed_memory()
