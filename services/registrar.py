"""The device/sensor registrar. Not implemented yet: see issue 3."""
import sys


def main() -> int:
    print("iot-registrar: not implemented yet (issue 3)", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
