"""omni-router: discovery, worker selection, affinity, admission, proxying."""
