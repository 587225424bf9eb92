"""prism.runtime.slice.replay_server: what slice and emulate share: the timed-replay clock, the dependency cone, the payload prefetch pool."""
