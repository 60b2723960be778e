"""Model definitions: one sub-package per architecture, plus the blocks they share (`layers`)."""
