//! The scripted fake model — for tests and demos, not a real model.
