"""rufus_eval."""
