"""Stage executors: what one stage of the pipeline computes, behind one interface."""
