"""A tiny synthetic world (procedural scenes, clips and captions) and its adherence evaluator."""
