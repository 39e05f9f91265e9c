"""vitsee.tui: the Textual terminal explorer."""
