"""HTTP plumbing under the handlers: the listening socket, connection and read limits, body limits,
access log, the OpenAPI document, garbage-collector policy, and keeping the API process free of torch."""
