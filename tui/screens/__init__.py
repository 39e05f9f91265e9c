"""vitsee.tui.screens: one screen per module (start, new run, run, explorer, pair detail, help)."""
