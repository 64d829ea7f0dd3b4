"""Looking inside trained models: learned kernels and attention maps as figures."""
