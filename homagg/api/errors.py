"""Errors of the job service, each carrying the gRPC status it is answered with, so the
service layer never guesses and a client sees a clear code and message, never a traceback."""

from __future__ import annotations

import grpc


class ControllerError(Exception):
    """A request the controller refuses; `status` is the gRPC code sent back."""

    status = grpc.StatusCode.INTERNAL


class InvalidArgument(ControllerError):
    """A malformed field: bad address, rank outside the world, pool size out of range..."""

    status = grpc.StatusCode.INVALID_ARGUMENT


class NotFound(ControllerError):
    """No such job (or switch)."""

    status = grpc.StatusCode.NOT_FOUND


class Unauthenticated(ControllerError):
    """The job's token is missing or wrong."""

    status = grpc.StatusCode.UNAUTHENTICATED


class PermissionDenied(ControllerError):
    """A known operator credential whose role does not allow the call or the job."""

    status = grpc.StatusCode.PERMISSION_DENIED


class AlreadyExists(ControllerError):
    """Another worker already joined with that rank."""

    status = grpc.StatusCode.ALREADY_EXISTS


class FailedPrecondition(ControllerError):
    """The job is in the wrong state for the call (ended, rank not joined, multi-switch...)."""

    status = grpc.StatusCode.FAILED_PRECONDITION


class ResourceExhausted(ControllerError):
    """No pool of the requested size fits on the switch (or its job tables are full)."""

    status = grpc.StatusCode.RESOURCE_EXHAUSTED


class DeadlineExceeded(ControllerError):
    """WaitReady timed out before every rank joined."""

    status = grpc.StatusCode.DEADLINE_EXCEEDED


class Unavailable(ControllerError):
    """The job's switch cannot be reached right now; retry later."""

    status = grpc.StatusCode.UNAVAILABLE


class Aborted(ControllerError):
    """The call was superseded (a newer WaitReady of the same rank); the newer one answers."""

    status = grpc.StatusCode.ABORTED
