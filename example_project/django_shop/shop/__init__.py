"""The shop's app: orders, the checkout that publishes their charge, the task that charges."""
