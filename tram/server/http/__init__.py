"""HTTP plumbing under the handlers: the listening socket, body limits, access log, the OpenAPI
document, garbage-collector policy, and keeping the API process free of torch."""
