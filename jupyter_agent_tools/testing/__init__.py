"""Test and load-test helpers: a real server subprocess (:mod:`.server`), a load driver (:mod:`.load`)."""
