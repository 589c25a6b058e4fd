"""The server's one error type: `ApiError`, an HTTP status with an OpenAI-shaped body
({"error": {"message", "type", "code", "param"}}), and the constructors for the errors raised in several places."""


class ApiError(Exception):
    """An error answered in OpenAI's shape with an HTTP status."""

    def __init__(self, status: int, message: str, type: str = "invalid_request_error", code: str | None = None,
                 param: str | None = None):
        super().__init__(message)
        self.status, self.message, self.type, self.code, self.param = status, message, type, code, param

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "code": self.code, "param": self.param}}


def bad_field(field: str, message: str, code: str | None = None) -> ApiError:
    """A 400 about request field `field`; `message` says what is wrong and names the field."""
    return ApiError(400, message, param=field, code=code)


def model_not_found(message: str, param: str | None = "model") -> ApiError:
    return ApiError(404, message, type="not_found_error", code="model_not_found", param=param)


def generation_failed(exc: BaseException) -> ApiError:
    """The 500 answered to a request that failed inside the engine."""
    return ApiError(500, f"generation failed: {type(exc).__name__}: {exc}", type="server_error",
                    code="internal_error")
