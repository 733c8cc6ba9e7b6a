"""Build a tiny OCI image layout with nothing but the standard library.

An OCI image layout is a directory holding ``oci-layout`` (the layout
version), ``index.json`` (the entry point: an index of manifests) and
content-addressed blobs under ``blobs/sha256/``: each manifest names a
config blob (JSON whose ``rootfs.diff_ids`` are the sha256 digests of the
uncompressed layer tars) and its layer blobs (here gzipped tars, media type
``application/vnd.oci.image.layer.v1.tar+gzip``, addressed by the digest of
the compressed bytes)."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import platform
import shutil
import tarfile
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

MANIFEST = "application/vnd.oci.image.manifest.v1+json"
INDEX = "application/vnd.oci.image.index.v1+json"
CONFIG = "application/vnd.oci.image.config.v1+json"
LAYER_GZIP = "application/vnd.oci.image.layer.v1.tar+gzip"
REF_NAME = "org.opencontainers.image.ref.name"


def oci_arch() -> str:
    m = platform.machine()
    return {"x86_64": "amd64", "aarch64": "arm64", "armv7l": "arm", "i686": "386"}.get(m, m)


@dataclass
class Built:
    """What :func:`busybox_layout` made."""

    path: str
    tag: str
    diff_ids: List[str] = field(default_factory=list)
    layer_digests: List[str] = field(default_factory=list)
    manifest_digest: str = ""
    config: Dict[str, object] = field(default_factory=dict)


def _tar(entries: Sequence[Tuple[str, str, bytes, int]]) -> bytes:
    """A deterministic tar of (name, kind, data-or-link-target, mode) entries;
    kind is "dir", "file" or "symlink"."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tf:
        for name, kind, data, mode in entries:
            ti = tarfile.TarInfo(name)
            ti.mode = mode
            ti.mtime = 1700000000
            if kind == "dir":
                ti.type = tarfile.DIRTYPE
                tf.addfile(ti)
            elif kind == "symlink":
                ti.type = tarfile.SYMTYPE
                ti.linkname = data.decode()
                tf.addfile(ti)
            else:
                ti.size = len(data)
                tf.addfile(ti, io.BytesIO(data))
    return buf.getvalue()


class _Blobs:
    def __init__(self, root: str) -> None:
        self.dir = os.path.join(root, "blobs", "sha256")
        os.makedirs(self.dir, exist_ok=True)

    def put(self, data: bytes) -> str:
        h = hashlib.sha256(data).hexdigest()
        with open(os.path.join(self.dir, h), "wb") as f:
            f.write(data)
        return "sha256:" + h


def busybox_layout(
    root: str,
    *,
    tag: str = "v1",
    busybox: Optional[str] = None,
    env: Sequence[str] = ("PATH=/bin", "OCI_GREETING=from-the-config"),
    working_dir: str = "/work",
    extra_files: Optional[Dict[str, bytes]] = None,
) -> Built:
    """Write an OCI layout at ``root`` holding one single-layer image (tagged
    ``tag``): the static busybox binary as /bin/busybox, /bin/sh a symlink to
    it, plus /tmp, ``working_dir`` and ``extra_files``."""
    bb = os.path.realpath(busybox or shutil.which("busybox") or "")
    if not bb or not os.path.isfile(bb):
        raise FileNotFoundError("busybox is not installed")
    with open(bb, "rb") as f:
        binary = f.read()
    entries: List[Tuple[str, str, bytes, int]] = [
        ("bin", "dir", b"", 0o755),
        ("tmp", "dir", b"", 0o1777),
        (working_dir.strip("/"), "dir", b"", 0o755),
        ("bin/busybox", "file", binary, 0o755),
        ("bin/sh", "symlink", b"busybox", 0o777),
    ]
    for name, data in sorted((extra_files or {}).items()):
        entries.append((name.lstrip("/"), "file", data, 0o644))
    tar = _tar(entries)
    gz = gzip.compress(tar, mtime=0)

    os.makedirs(root, exist_ok=True)
    blobs = _Blobs(root)
    diff_id = "sha256:" + hashlib.sha256(tar).hexdigest()
    layer = blobs.put(gz)
    config: Dict[str, object] = {
        "architecture": oci_arch(),
        "os": "linux",
        "config": {"Env": list(env), "Cmd": ["/bin/sh"], "WorkingDir": working_dir, "User": "0"},
        "rootfs": {"type": "layers", "diff_ids": [diff_id]},
        "history": [{"created_by": "tests/ocilayout.py"}],
    }
    cfg = json.dumps(config).encode()
    manifest = json.dumps(
        {
            "schemaVersion": 2,
            "mediaType": MANIFEST,
            "config": {"mediaType": CONFIG, "digest": blobs.put(cfg), "size": len(cfg)},
            "layers": [{"mediaType": LAYER_GZIP, "digest": layer, "size": len(gz)}],
        }
    ).encode()
    mdigest = blobs.put(manifest)
    index = {
        "schemaVersion": 2,
        "mediaType": INDEX,
        "manifests": [
            {"mediaType": MANIFEST, "digest": mdigest, "size": len(manifest), "annotations": {REF_NAME: tag}}
        ],
    }
    with open(os.path.join(root, "index.json"), "w") as f:
        json.dump(index, f)
    with open(os.path.join(root, "oci-layout"), "w") as f:
        json.dump({"imageLayoutVersion": "1.0.0"}, f)
    return Built(path=root, tag=tag, diff_ids=[diff_id], layer_digests=[layer], manifest_digest=mdigest, config=config)
