"""prism.runtime.emulate: emulate mode: the sandbox's transport, the replay workers, pruning and compensation."""
