"""What pyproject.toml cannot say: the packages found, plus two root folders installed as packages
(a `packages.find` table takes no package mapped from another folder): catalogs/ as rufus_catalogs,
its subfolders (stages, suites, samples ...) as its subpackages, and docs/ as rufus_docs, so the
pages that messages and help cite are on a machine that installed the wheel. The build also copies
the root constraints.txt into rufus_docs (`rufus-data env --constraints` prints it). Everything
else is in pyproject.toml."""

from pathlib import Path

from setuptools import find_namespace_packages, find_packages, setup
from setuptools.command.build_py import build_py

CATALOGS = "rufus_catalogs"
DOCS = "rufus_docs"
CONSTRAINTS = "constraints.txt"


class BuildWithConstraints(build_py):
    """build_py, plus constraints.txt (a root file, outside every package) copied into rufus_docs."""

    def run(self):
        super().run()
        if not self.editable_mode:  # an editable install reads the checkout's own file
            target = Path(self.build_lib) / DOCS / CONSTRAINTS
            self.mkpath(str(target.parent))
            self.copy_file(CONSTRAINTS, str(target))


setup(
    packages=[
        *find_packages(include=["rufus_data*", "rufus_train*", "rufus_eval*"]),
        CATALOGS,
        *(f"{CATALOGS}.{folder}" for folder in find_namespace_packages(where="catalogs")),
        DOCS,
    ],
    package_dir={CATALOGS: "catalogs", DOCS: "docs"},
    cmdclass={"build_py": BuildWithConstraints},
)
