"""docs/usage.md documents every console script of pyproject.toml, with its module and its door."""
import os
import re
import tomllib

from helpers import REPO


def test_every_console_script_is_documented_with_its_module_and_door():
    with open(os.path.join(REPO, "pyproject.toml"), "rb") as f:
        scripts = tomllib.load(f)["project"]["scripts"]
    with open(os.path.join(REPO, "docs", "usage.md"), encoding="utf-8") as f:
        rows = re.findall(r"^\| `(qknorm-[\w-]+)` \| [^|]+ \| `([\w.]+)` \| (.+) \|$", f.read(), re.M)
    assert {name: module + ":main" for name, module, _ in rows} == scripts
    for _, module, door in rows:
        m = re.match(r"`(\w+\.sh)`$", door)
        if m:  # the door runs the same module
            assert f"door {module.removesuffix('.__main__')} " in open(os.path.join(REPO, "scripts", m[1])).read()
        else:
            assert door.startswith("none (")
