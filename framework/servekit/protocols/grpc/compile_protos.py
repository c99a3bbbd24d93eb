"""Regenerate the checked-in ``*_pb2.py`` / ``*_pb2.pyi`` / ``*_pb2_grpc.py`` from ``protos/**/*.proto``.

Run ``python -m servekit.protocols.grpc.compile_protos`` after editing a ``.proto``
(needs ``grpcio-tools``; the server itself does not).  The generated modules are
rewritten to register in :data:`servekit.protocols.grpc.protos.pool.POOL`
instead of protobuf's default pool, so they coexist with TensorFlow's own
modules of the same message names; ``--check`` fails when the checked-in files
differ from what the ``.proto`` files generate.  The ``.pyi`` stubs (protoc's
``--pyi_out``) give type checkers the message classes and their fields, which the
``_pb2.py`` modules only build at run time.

protoc's runtime-version guard is taken out of the ``_pb2.py`` modules: it
refuses any protobuf older than the protoc that wrote them, although the
modules use nothing newer than :data:`OLDEST_PROTOBUF` (the ``grpc`` extra's
floor).  Installing a client that pins an older protobuf beside servekit (the
Triton client wants protobuf 6) then no longer stops ``servekit serve``.
"""

from __future__ import annotations

import argparse
import re
import shutil
import sys
import tempfile
from pathlib import Path

PROTOS = Path(__file__).parent / "protos"
#: The import root: proto paths (and so Python module paths) start at ``servekit/``.
ROOT = PROTOS.parents[3]
_POOL_IMPORT = "from servekit.protocols.grpc.protos.pool import POOL as _POOL\n"
#: The oldest protobuf runtime the generated modules are tested with (pyproject's ``grpc`` extra).
OLDEST_PROTOBUF = "5.26.1"
_GUARD_IMPORT = "from google.protobuf import runtime_version as _runtime_version\n"
_GUARD = re.compile(r"_runtime_version\.ValidateProtobufRuntimeVersion\(\n(?: {4}.*\n)*?\)\n")
_NO_GUARD = f"# runtime-version guard removed by servekit.protocols.grpc.compile_protos: protobuf>={OLDEST_PROTOBUF} reads this\n"


def proto_files() -> list[Path]:
    return sorted(PROTOS.rglob("*.proto"))


def generate(out: Path) -> list[Path]:
    """Compile every ``.proto`` into ``out`` (mirroring ``ROOT``); returns the files written."""
    import grpc_tools
    from grpc_tools import protoc

    include = Path(grpc_tools.__file__).parent / "_proto"
    sources = [str(p.relative_to(ROOT)) for p in proto_files()]
    args = [
        "protoc",
        f"-I{ROOT}",
        f"-I{include}",
        f"--python_out={out}",
        f"--pyi_out={out}",
        f"--grpc_python_out={out}",
        *sources,
    ]
    if protoc.main(args) != 0:
        raise SystemExit("protoc failed; see the messages above")
    written = []
    for path in sorted([*out.rglob("*.py"), *out.rglob("*.pyi")]):
        if path.name.endswith("_pb2_grpc.py") and "class " not in path.read_text():
            path.unlink()  # a file without a service gets an empty stub module
            continue
        if path.name.endswith("_pb2.py"):
            path.write_text(_without_version_guard(_use_private_pool(path.read_text(), path), path))
        written.append(path)
    return written


def _use_private_pool(source: str, path: Path) -> str:
    default = "_descriptor_pool.Default().AddSerializedFile("
    marker = "# @@protoc_insertion_point(imports)\n"
    if source.count(default) != 1 or marker not in source:
        raise SystemExit(f"{path.name}: unexpected protoc output; cannot redirect it to the private pool")
    return source.replace(marker, marker + "\n" + _POOL_IMPORT).replace(default, "_POOL.AddSerializedFile(")


def _without_version_guard(source: str, path: Path) -> str:
    if source.count(_GUARD_IMPORT) != 1 or len(_GUARD.findall(source)) != 1:
        raise SystemExit(f"{path.name}: unexpected protoc output; cannot take out its runtime-version guard")
    return _GUARD.sub(_NO_GUARD, source.replace(_GUARD_IMPORT, ""))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only compare with the checked-in files")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        stale = []
        for path in generate(out):
            target = ROOT / path.relative_to(out)
            if not target.exists() or target.read_text() != path.read_text():
                stale.append(target)
                if not args.check:
                    shutil.copyfile(path, target)
    for target in stale:
        print(("stale: " if args.check else "wrote: ") + str(target.relative_to(ROOT)))
    return 1 if args.check and stale else 0


if __name__ == "__main__":
    sys.exit(main())
