"""One handler per endpoint (completions, chat, responses, legacy /generate, beam search), and the
stream plumbing they share."""
