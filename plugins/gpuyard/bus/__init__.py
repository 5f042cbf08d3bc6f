"""The event bus: at-least-once delivery of "look at job X" messages to consumer groups."""
