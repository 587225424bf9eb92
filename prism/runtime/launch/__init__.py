"""prism.runtime.launch: launching ranks: the launcher, its spec, the warm zygote and the forked ranks."""
