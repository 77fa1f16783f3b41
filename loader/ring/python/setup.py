# The build's temporaries (setuptools' build/ and numa_loader.egg-info) go to
# a directory of their own, removed when the build ends, so
# `pip install <build>/python` leaves the build tree as it was. Everything
# else is in pyproject.toml.
import atexit
import shutil
import tempfile

from setuptools import setup

scratch = tempfile.mkdtemp(prefix="numa-loader-build-")
atexit.register(shutil.rmtree, scratch, True)
setup(options={"build": {"build_base": scratch + "/build"}, "egg_info": {"egg_base": scratch}})
