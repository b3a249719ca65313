"""Stage 1, pairing: the hooks' logs read, each training dump paired with the inference dump of the same prompt
(``align``), the pairs file written and read back. Imports no later stage."""
