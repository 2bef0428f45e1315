"""Every code block of the five seed pages, ported to feedline and run."""
