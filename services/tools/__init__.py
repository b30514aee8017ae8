"""Operator and lab command-line tools: `iot-topics` (topics), `iot-simulator` (simulator),
`iot-registrar` (registrar), and the simulated fleet they share (fleet)."""
