"""What every launched process runs: ``olmx run PLAN`` (:mod:`.run`) builds the model, the
train module and the Trainer from the saved plan (the only place that builds OLMo-core objects)."""
