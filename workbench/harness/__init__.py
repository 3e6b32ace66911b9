"""The benchmark harness behind the `hytopk` CLI: presets, timing, the oracle,
compare, calibrate, watch, winners, doctor and the report writers."""
