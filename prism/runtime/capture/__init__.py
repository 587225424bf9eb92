"""prism.runtime.capture: capture mode: the coordinator, its client and transport, device-state swapping."""
