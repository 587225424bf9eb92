"""prism.runtime.slice: slice mode: the slice transport and the replay server that answers for virtual ranks."""
