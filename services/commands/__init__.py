"""Operator and lab command-line tools: `iot-topics` (topics), `iot-simulator` (simulator),
`iot-registrar` (registrar), `iot-devices` (devices: a site's device logins), and the simulated fleet
they share (fleet)."""
