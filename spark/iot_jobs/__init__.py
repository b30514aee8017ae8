"""Pure transforms and wiring helpers of the iot-stack Spark jobs.

The job files in `spark/jobs/` put this folder's parent on the driver's
sys.path, and runtime.ship_package makes cloudpickle carry this package's code
by value to Spark's Python workers, so a job is submitted as a plain file with
no --py-files and works in local mode and on a standalone cluster alike.
"""
