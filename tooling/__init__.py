"""Developer tools, one package per audience: build/ (what site.yml's images role runs on the controller),
lab/ (scripts/lab and the fault suite), bench/ (scripts/bench), testbed/ (what the tests start and render).
The commands shipped in the images are elsewhere: services/commands."""
