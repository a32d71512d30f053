"""What pyproject.toml cannot say: the packages found, plus the repository's root catalogs/ folder
installed as the package rufus_catalogs, its subfolders (stages, suites, samples ...) as its
subpackages (a `packages.find` table takes no package mapped from another folder). Everything
else is in pyproject.toml."""

from setuptools import find_namespace_packages, find_packages, setup

CATALOGS = "rufus_catalogs"

setup(
    packages=[
        *find_packages(include=["rufus_data*", "rufus_train*", "rufus_eval*"]),
        CATALOGS,
        *(f"{CATALOGS}.{folder}" for folder in find_namespace_packages(where="catalogs")),
    ],
    package_dir={CATALOGS: "catalogs"},
)
