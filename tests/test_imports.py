import subprocess
import sys

CORE = [
    "seqpack",
    "seqpack.core.examples",
    "seqpack.core.policies",
    "seqpack.core.batch",
    "seqpack.core.permission",
    "seqpack.core.counts",
    "seqpack.core.budget",
    "seqpack.demo",
    "seqpack.core.stream_packer",
    "seqpack.core.compact",
    "seqpack.core.loss",
    "seqpack.io.tokenizers",
]


def test_core_modules_import_without_torch():
    code = (
        "import sys; sys.modules['torch'] = None\n"
        + "".join(f"import {m}\n" for m in CORE)
        + "from seqpack.demo import demo_trace; demo_trace()\n"
        + "assert 'torch' not in {k for k, v in sys.modules.items() if v is not None}\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
