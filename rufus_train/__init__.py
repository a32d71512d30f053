"""rufus_train."""
