"""Static files vitsee ships (colormaps, sample configs)."""
