"""`oculis status --check-deps`: each prerequisite as PASS / WARN / FAIL with its fix."""
