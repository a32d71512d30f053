"""The catalogs Rufus ships: installed as the package `rufus_catalogs` (setup.py maps it onto this
folder), read by rufus_data/base/catalog_files.py. Copy one out to edit: `rufus-data catalogs copy`."""
