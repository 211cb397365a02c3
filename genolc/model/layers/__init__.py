"""Plain torch modules of the GLM-5.3-Flash decoder; no optimisation flags inside."""
