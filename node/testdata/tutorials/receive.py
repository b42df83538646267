#!/usr/bin/env python3
import os
import sys
import pika


def main():
    connection = pika.BlockingConnection(
        pika.ConnectionParameters(host='localhost', port=int(os.environ.get('AMQP_PORT', 5672))))
    channel = connection.channel()

    channel.queue_declare(queue='hello')

    def callback(ch, method, properties, body):
        print(f" [x] Received {body}", flush=True)

    channel.basic_consume(queue='hello', on_message_callback=callback, auto_ack=True)

    print(' [*] Waiting for messages. To exit press CTRL+C', flush=True)
    channel.start_consuming()


if __name__ == '__main__':
    try:
        main()
    except KeyboardInterrupt:
        print('Interrupted')
        try:
            sys.exit(0)
        except SystemExit:
            os._exit(0)
