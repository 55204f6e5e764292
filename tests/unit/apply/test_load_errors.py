"""A snapshot load's failed read of staged rows (``snapshot.unread_rows``): the way out that exists for its cause,
from the exact texts pyarrow and Spark give (pyarrow raises an object store's errors as a plain ``OSError`` without
an errno), and a line that keeps the message around a quoted value but never the value."""

from __future__ import annotations

from types import SimpleNamespace

import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st

from airflow_provider_pglogical.apply.targets.postgres.copy import copy_error, server_primary, without_quoted
from airflow_provider_pglogical.apply.targets.postgres.snapshot import FeedError, unread_rows

TABLE = SimpleNamespace(source="public.t", target="public.t")
RERUN = "rerun the apply to load it whole"
READ_ACCESS = "give the apply read access to the staging area, then rerun it"
RESYNC = "stage the table again: pglogical resync --table public.t"
UNKNOWN = "rerun the apply; if it fails the same way: pglogical resync --table public.t"


class JavaError(Exception):
    """Like py4j's ``Py4JJavaError``: its text is the whole Java stack, the first line a call's."""

    __module__ = "py4j.protocol"


class PythonException(Exception):
    """Like pyspark's: an executor's Python error, its worker's traceback in the text."""

    __module__ = "pyspark.errors.exceptions.captured"


def _worker(error: str) -> PythonException:
    """An executor's failed pyarrow read of the store (``executor_reads``) as the driver gets it."""
    return PythonException("\n  An exception was thrown from the Python worker. Please see the stack trace below.\n"
                           "Traceback (most recent call last):\n  File \"pyarrow/_fs.pyx\", line 789, in "
                           f"pyarrow._fs.FileSystem.open_input_file\n{error}\n")


def _head(operation: str, error: str) -> str:
    """pyarrow's text of an S3 request that failed (as it reads moto's answer to a HEAD of ``f.parquet``)."""
    return (f"When getting information for key 'stage/f.parquet' in bucket 'lake': AWS Error {error} during "
            f"{operation} operation: No response body.")


SHOWN_HEAD = "When getting information for key …: AWS Error {} during HeadObject operation: No response body."
CASES = [
    (OSError(_head("HeadObject", "ACCESS_DENIED")), "OSError: " + SHOWN_HEAD.format("ACCESS_DENIED"), READ_ACCESS),
    (OSError(_head("HeadObject", "UNKNOWN (HTTP status 503)")),
     "OSError: " + SHOWN_HEAD.format("UNKNOWN (HTTP status 503)"), RERUN),
    (OSError(_head("HeadObject", "UNKNOWN (HTTP status 500)")),
     "OSError: " + SHOWN_HEAD.format("UNKNOWN (HTTP status 500)"), RERUN),
    (OSError(_head("HeadObject", "UNKNOWN (HTTP status 429)")),
     "OSError: " + SHOWN_HEAD.format("UNKNOWN (HTTP status 429)"), RERUN),
    (OSError("When reading information for key 'stage/f.parquet' in bucket 'lake': AWS Error SLOW_DOWN during "
             "GetObject operation: Please reduce your request rate."),
     "OSError: When reading information for key …: AWS Error SLOW_DOWN during GetObject operation: "
     "Please reduce your request rate.", RERUN),
    (OSError("When reading information for key 'k' in bucket 'b': AWS Error THROTTLING during GetObject operation"),
     "OSError: When reading information for key …: AWS Error THROTTLING during GetObject operation",
     RERUN),
    (OSError("When reading information for key 'k' in bucket 'b': AWS Error NETWORK_CONNECTION during GetObject "
             "operation: curlCode: 7"), None, RERUN),
    (OSError("When listing objects under key 'stage/f.parquet' in bucket 'lake': AWS Error NO_SUCH_KEY during "
             "ListObjectsV2 operation: x"), None, RESYNC),
    (FileNotFoundError("lake/stage/c1.parquet"), "FileNotFoundError: lake/stage/c1.parquet", RESYNC),
    (OSError("Couldn't deserialize thrift: TProtocolException: Invalid data"),
     "OSError: Couldn't deserialize thrift: TProtocolException: Invalid data", RESYNC),
    # pyarrow's text of a damaged file: the apostrophe of "footer's" is no quote
    (pa.ArrowInvalid(
        "Could not open Parquet input source 'lake/stage/f.parquet': Parquet file size is 22 bytes, smaller than "
        "the size reported by footer's (1701273954bytes)"),
     "ArrowInvalid: Could not open Parquet input source …: Parquet file size is 22 bytes, smaller than the size "
     "reported by footer's (1701273954bytes)", RESYNC),
    (JavaError("An error occurred while calling o85.toLocalIterator.\n: org.apache.spark.SparkException: Job "
               "aborted due to stage failure: ExecutorLostFailure (executor 1 exited)"),
     "JavaError: An error occurred while calling o85.toLocalIterator.", RERUN),
    (JavaError("An error occurred while calling o85.toLocalIterator.\n: org.apache.spark.SparkException: "
               "java.io.FileNotFoundException: File file:/stage/c00001.parquet does not exist"), None, RESYNC),
    (JavaError("[FAILED_READ_FILE.CANNOT_READ_FILE_FOOTER] Encountered error while reading file "
               "file:///stage/c00001.parquet. Could not read footer."), None, RESYNC),
    (JavaError("[FAILED_READ_FILE.FILE_NOT_EXIST] File file:/stage/c00001.parquet does not exist."), None, RESYNC),
    (JavaError("[PATH_NOT_FOUND] Path does not exist: file:/stage/c00001.parquet."), None, RESYNC),
    (JavaError("An error occurred while calling o85.toLocalIterator.\n: java.nio.file.AccessDeniedException: "
               "s3a://lake/stage/c1.parquet: getFileStatus on s3a://lake/stage/c1.parquet: 403 Forbidden"),
     "JavaError: An error occurred while calling o85.toLocalIterator.", READ_ACCESS),
    (JavaError("An error occurred while calling o85.toLocalIterator.\n: org.apache.spark.SparkException: "
               "ExecutorLostFailure\n\tat org.apache.spark.scheduler.DAGScheduler.run(DAGScheduler.scala:403)"),
     None, RERUN),
    (OSError(_head("HeadObject", "UNKNOWN (HTTP status 403)")), None, READ_ACCESS),
    (OSError("google::cloud::Status(PERMISSION_DENIED: Permission 'storage.objects.get' denied on 'lake/stage/c1'"),
     None, READ_ACCESS),
    (OSError("GetProperties for 'lake/stage/f.parquet' failed. Azure Error: [AuthorizationFailure] This request is "
             "not authorized to perform this operation."), None, READ_ACCESS),
    (OSError("Parquet magic bytes not found in footer. Either the file is corrupted or this is not a parquet file."),
     None, RESYNC),
    (OSError("Unexpected end of stream: Page was smaller than expected"), None, UNKNOWN),
    # pyarrow's Parquet reader's texts of a damaged column chunk or page
    (OSError("Invalid column metadata (corrupt file?)"), None, RESYNC),
    (OSError("Corrupt snappy compressed data."), None, RESYNC),
    # Azure and GCS as pyarrow raises them (the Azure text as Azurite answers a read of a blob deleted after it was
    # opened; GCS's NOT_FOUND and PERMISSION_DENIED come as FileNotFoundError / PermissionError by their errno)
    (OSError("DownloadTo from 'http://127.0.0.1:1/devstoreaccount1/stage/f.parquet' at position 172973 for 57658 "
             "bytes failed. ReadAt failed to read the required byte range. Azure Error: [BlobNotFound] 404 The "
             "specified blob does not exist.\nThe specified blob does not exist.\nRequestId:d81bbaf9"), None, RESYNC),
    (OSError("GetProperties for 'lake/stage' failed. Azure Error: [ContainerNotFound] 404 The specified container "
             "does not exist."), None, RESYNC),
    (OSError("DownloadTo from 'x' failed. Azure Error: [ServerBusy] 503 The server is busy."), None, RERUN),
    (OSError("google::cloud::Status(DEADLINE_EXCEEDED: Retry policy exhausted in ReadObject)"), None, RERUN),
    (pa.ArrowCapacityError("google::cloud::Status(RESOURCE_EXHAUSTED: Permanent error in ReadObject: rate "
                           "limit exceeded)"), None, RERUN),
    (FileNotFoundError(2, "google::cloud::Status(NOT_FOUND: Permanent error, with a last message of Received HTTP "
                          "status code: 404)"), None, RESYNC),
    # an executor's pyarrow read of a file that is gone, damaged, or refused; a lost executor is not
    (_worker("FileNotFoundError: [Errno 2] Path does not exist 'stage/f.parquet'. Detail: [errno 2] No such file"),
     None, RESYNC),
    (_worker("OSError: When reading information for key 'k' in bucket 'b': AWS Error NO_SUCH_KEY during GetObject"),
     None, RESYNC),
    # a FileNotFoundError of the worker's own code, not pyarrow's read of a staged file: no resync
    (PythonException("\n  An exception was thrown from the Python worker.\nTraceback (most recent call last):\n  File "
                     "\"/usr/lib/python3/site-packages/pyspark/worker.py\", line 1247, in main\n    "
                     "func, profiler = read_udfs()\nFileNotFoundError: [Errno 2] No such file or directory: "
                     "'/tmp/spark-1/udf.py'\n"), None, RERUN),
    (_worker("pyarrow.lib.ArrowInvalid: Could not open Parquet input source 'stage/f.parquet': Parquet magic bytes "
             "not found in footer."), None, RESYNC),
    (_worker("OSError: DownloadTo from 'x' failed. Azure Error: [AuthorizationFailure] 403 This request is not "
             "authorized"), None, READ_ACCESS),
    # a value's conversion is not the file's damage: a rerun, then the resync (which stages the values anew)
    (pa.ArrowInvalid("Failed to parse string: 'alice@x' as a scalar of type int64"),
     "ArrowInvalid: Failed to parse string: … as a scalar of type int64", UNKNOWN),
    (pa.ArrowInvalid("Rescaling Decimal value would cause data loss"), None, UNKNOWN),
    (ValueError("row 'alice@x' has too many fields"), "ValueError: row … has too many fields", UNKNOWN),
    (KeyError("alice@x"), "KeyError", UNKNOWN),
]


@pytest.mark.parametrize(("cause", "shown", "way_out"), CASES)
def test_a_failed_read_names_the_way_out_of_its_cause_and_no_quoted_value(cause, shown, way_out):
    error = unread_rows(0x1000, "public.t", TABLE, FeedError(cause))  # type: ignore[arg-type]
    line = str(FeedError(cause))
    assert str(error) == f"{error.reason}; {way_out}"
    assert shown is None or line == shown, line
    for quoted in ("stage/f.parquet", "lake'", "alice@x"):
        assert quoted not in line


@given(st.text(st.characters(blacklist_categories=("Cs",)), min_size=1),
       st.sampled_from(['value "{}" is out of range for type integer', 'invalid input syntax for type json: "{}"',
                        "Failed to parse string: '{}' as a scalar of type int64"]))
def test_a_quoted_value_never_survives_whatever_quotes_it_holds(value, message):
    """PostgreSQL and pyarrow quote a value without escaping the quotes in it (``"12" 345"``)."""
    shown = " ".join(message.replace('"{}"', "…").replace("'{}'", "…").split())
    assert without_quoted(message.format(value)) == shown
    error = SimpleNamespace(pgcode="22P02", diag=SimpleNamespace(message_primary=message.format(value)))
    # what is left of the message is its start (a value's own ``: "`` or line break cuts it short), never more
    assert shown.startswith(server_primary(error))  # type: ignore[arg-type]
    assert f"ValueError: {shown}".startswith(str(FeedError(ValueError(message.format(value)))))


def test_a_copy_error_keeps_no_part_of_a_value_with_a_quote_in_it():
    error = SimpleNamespace(pgcode="22P02", diag=SimpleNamespace(
        message_primary='invalid input syntax for type integer: "12" 345-67-89"', context=None))
    assert str(copy_error("s", error, 0)) == (  # type: ignore[arg-type]
        "COPY into s failed: [22P02] invalid input syntax for type integer: …")
    assert str(FeedError(ValueError("Failed to parse string: 'ab' cd' as a scalar of type int64"))) == (
        "ValueError: Failed to parse string: … as a scalar of type int64")
