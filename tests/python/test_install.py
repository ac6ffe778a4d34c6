"""`pip install ./python` works offline (Debian 12's system Python is
externally managed: a venv with the system's site packages), and the
installed package finds the library through $KVPAGE_LIB from anywhere."""
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.skipif("asan" in os.environ.get("LD_PRELOAD", ""),
                    reason="pip under a preloaded sanitizer runtime: the release run covers it")
def test_pip_install_into_a_venv(tmp_path):
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)],
                   check=True, timeout=300)
    py = str(venv / "bin" / "python")
    src = tmp_path / "src"  # a copy: pip's build must not write into the source tree
    subprocess.run(["cp", "-r", os.path.join(ROOT, "python"), str(src)], check=True)
    p = subprocess.run([py, "-m", "pip", "install", "--no-build-isolation", "--no-index", "-q",
                        str(src)], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    lib = os.environ.get("KVPAGE_LIB") or os.path.join(ROOT, "build", "libkvpage.so")
    code = ("import kvpage, kvpage.compat, sys; "
            "assert kvpage.__file__.startswith(sys.prefix), kvpage.__file__; "
            "print(kvpage.library_path)")
    p = subprocess.run([py, "-c", code], capture_output=True, text=True, cwd=str(tmp_path),
                       env=dict(os.environ, KVPAGE_LIB=lib), timeout=120)
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == lib
    # without a library anywhere: a clear ImportError naming what was tried
    env = {k: v for k, v in os.environ.items() if k != "KVPAGE_LIB"}
    env["KVPAGE_LIB"] = str(tmp_path / "nowhere.so")
    env["LD_LIBRARY_PATH"] = ""
    p = subprocess.run([py, "-c", "import kvpage"], capture_output=True, text=True,
                       cwd=str(tmp_path), env=env, timeout=120)
    if p.returncode == 0:  # an installed copy was found (make install on this machine)
        return
    assert "cannot load libkvpage.so; tried:" in p.stderr and "nowhere.so" in p.stderr
