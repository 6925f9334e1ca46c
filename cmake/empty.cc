// Keeps a folder library valid while the folder has no .cc of its own (header-only templates).
