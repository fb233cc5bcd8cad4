"""Model families: one home per kind of model (`family.ModelFamily`), found by the manifest's
kind (`catalog.family_of`) and loaded through one path (`loading.load_model`)."""
