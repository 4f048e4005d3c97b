"""A checkpoint's files and folders reach the disk before the folder is renamed into place.

No test can pull the power, so this one records what `_fsync_tree` hands to `os.fsync`: every file and every
folder of the tree, nested ones included.
"""

from __future__ import annotations

import os

from credo import checkpoint


def test_fsync_tree_syncs_every_file_and_folder(tmp_path, monkeypatch):
    (tmp_path / "a" / "b").mkdir(parents=True)
    files = [tmp_path / "meta.json", tmp_path / "a" / "x.pt", tmp_path / "a" / "b" / "y.pt"]
    for f in files:
        f.write_bytes(b"data")
    synced = []
    real_fsync = os.fsync

    def recording_fsync(fd):
        synced.append(os.path.realpath(f"/proc/self/fd/{fd}"))
        real_fsync(fd)

    monkeypatch.setattr(checkpoint.os, "fsync", recording_fsync)
    checkpoint._fsync_tree(tmp_path)
    want = [str(p) for p in files] + [str(tmp_path), str(tmp_path / "a"), str(tmp_path / "a" / "b")]
    assert sorted(synced) == sorted(os.path.realpath(p) for p in want)
